"""The ground floor of bertserve: every declaration and the code that runs a model.

Tasks (`tasks/`, one file each, found by `tasks/registry.py`), head kinds (`heads.py`), model families
(`families/`, one file each) and every command's options (`options.py`) are declared here; so are the config,
the one encoder (`model.py`), checkpoint directories (`checkpoint.py`) and the tokenizers. It imports none of the
applications above it (training, export, serving, batch). See docs/core.md and docs/architecture.md.
"""
