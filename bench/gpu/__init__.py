"""The GPU proof kit: prepared here (prepare.py), run there in one command (kit.py); see README.md."""
