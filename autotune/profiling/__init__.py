"""`autotune profile`: tune the methods that can win, choose on search prompts, measure
the finalists once on held-back prompts, write the profile.

The run goes cheapest evidence first, re-planning before every phase from what it has
learned (``autotune.plan`` holds every share of the time). Its modules, in the order the
run takes them (``run.run_profile`` is the ladder):

- ``request``: what was asked; ``setup``: which methods, their search spaces and heads,
  every check that needs no model, before any long work;
- ``calibrate``: the model and prompts opened, the machine checked, the plan's facts
  measured, the target's greedy answers decoded;
- ``probe``: each method's cheap evidence (the draft-free ones measure a first leader;
  the others get an optimistic bound, and are skipped when it cannot beat the leader's
  lower bound);
- ``tune``: the training and tuning of the methods left (the leader's study first) and
  the expansions fitted (CAPE);
- ``select``: the finalists side by side on search prompts;
- ``heldback``: against plain greedy, on prompts no choice was made on; then each
  engine's own setting;
- ``verdict``: the rules that recommend (or not);
- ``in_engine``: deploying to llama.cpp, its candidates measured in llama-server itself,
  and the llama.cpp verdict made from that;
- ``load``: the recommended method under load, level by level;
- ``report``: the profile assembled, and the lines that tell people about it.

``state`` holds the run's state between phases and the ledger of where the time went:
each phase is a function from one state to the next.
"""

from autotune.profiling.report import verdict_lines
from autotune.profiling.request import ProfileRequest, parse_methods
from autotune.profiling.run import run_profile

__all__ = ["ProfileRequest", "parse_methods", "run_profile", "verdict_lines"]
