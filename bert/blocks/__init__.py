"""The encoder's building blocks, each a small object a family chooses: positions, attention, MLP and norm
placement. bert/model.py assembles the chosen ones into the one encoder forward."""
