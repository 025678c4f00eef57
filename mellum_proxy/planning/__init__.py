"""`mellum-proxy fit`: the tuning guide's order, measured on the user's own server.

The paper sweep narrows the grid to a few candidates (`candidates`); `fit` starts the server with each one's
knobs in turn (`launch`), measures memory, first-token times at a short and a near-limit prompt, failures and a
quality spot check (`measure`), chooses by the guide's rule from what it measured (`choice`) and writes the
defaults, the proxy's config and the report (`report`). The command itself is in `cli`.
"""
