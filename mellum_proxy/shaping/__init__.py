"""Text shaping: what a completion may show while it streams. `lines.py` holds back what follows a cut
completion's last complete line; `cleanup.py` ends a completion where the plugins' own post-processing
would (a FIM marker, a repeat of the suffix, a scope's end). Both read only text, never a flight."""
