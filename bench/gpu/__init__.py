"""The GPU benchmark: a bundle prepared where the data and PyPI are (prepare.py), run on a CUDA machine in one
command (kit.py); see README.md."""
