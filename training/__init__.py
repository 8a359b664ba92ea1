"""Training commands: `python -m training.pretrain` (MLM + NSP from a corpus), `training.finetune` (one task),
`training.multitask` (one encoder, a head per task), `training.evaluate` (metrics JSON) and `training.mine_rerank`
(hard negatives), over one loop (`loop.py`) and one typed config (`config.py`). A task's data reader, loss and
metric are the task's, in bert/tasks/. Of bertserve it imports only bert/. See docs/training.md.
"""
