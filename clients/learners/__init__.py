"""The learners: algorithms, their state and the run they learn in.

``ppo`` and ``sac`` (each algorithm's learner and its ``learn(run, settings)`` loop,
readable top to bottom; ``_graphed`` their CUDA-graph steps; ``_train_sac`` what SAC builds
before it learns), ``_replay`` (the replay buffer), ``_checkpoint`` (checkpoints and exact
resume), ``_run`` (the run's toolbox: source, checkpoints, signals, outputs) and
``_logdir`` (one writer per log directory, ``progress.jsonl``, TensorBoard), ``_train`` (the one entry point's plan and execution:
:func:`simkit.train`), the fragment sources (``_sources``: in process, on the host or in
the device loop; servers ``_server_source``), ``_args`` (settings,
torch-free), ``_train_cli`` (the ``simkit train`` / ``eval`` command lines), ``_evaluate``,
``_progress`` and ``_learner_metrics``.
"""
