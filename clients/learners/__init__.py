"""The learners: algorithms, their state and the one training run.

``ppo`` and ``sac`` (the algorithms, each readable top to bottom; ``_graphed`` their CUDA-graph
steps), ``_replay`` (the replay buffer), ``_checkpoint`` (checkpoints and exact resume),
``_run`` / ``_loop`` / ``_run_parts`` (the one training run every algorithm goes through),
``_train`` / ``_train_sac`` (the algorithms' parts of it), the fragment sources of a run
(``_rollout``: in process ``_local_source``, servers ``_server_source``, the device loop
``_device_source``), ``_args`` (settings, torch-free), ``_train_cli`` (the ``simkit train`` /
``eval`` command lines), ``_progress`` and ``_learner_metrics``.
"""
