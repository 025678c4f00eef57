"""The serving room: a completion from a normalized request to its answer.

`service.py` (`CompletionService`: the policies, the budget, the record) starts `flight.py`'s upstream requests
(each a task of its own) and relays them; `reuse.py` answers a keystroke that typed through a completion from
that completion, finished or still streaming. Below it: the guards (`mellum_proxy.policies`), text shaping
(`mellum_proxy.shaping`), the budget and the upstream; above it, the HTTP edge. It knows no HTTP.
"""

from mellum_proxy.serving.policy_set import Policies
from mellum_proxy.serving.service import CompletionService

__all__ = ["CompletionService", "Policies"]
