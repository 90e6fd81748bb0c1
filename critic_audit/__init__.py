"""critic-audit: audit an LLM agent critic's turn structure, and train with turn-level credit (MPO).

Layers (imports flow one way): ``cli -> train | analysis | plots | critic -> rl | turns | io -> schema, errors``.
The library never imports typer or rich; long jobs report progress through a callback.
"""

__version__ = "0.1.0"
