"""The sampling side, pure: where a refill's prompts come from (``streams``), how likely a prompt's next group is
to teach (``success_rate``, ``skipping``), and the refill planner (``refill``, ``rounds``, ``sizes``), which says what
each round generates and calls nothing of the trainer. Imports nothing of TRL, transformers, accelerate, datasets or
peft.
"""
