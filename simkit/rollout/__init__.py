"""The one rollout loop: act, step, store, autoreset, over env rows, shared by the rollout
servers' stream sessions (``simkit.servers``) and the learners' in-process source
(``simkit.clients.learners``), so a run in process and a run through any number of
servers give the same fragments, bit for bit. Neither side imports the other's private
modules; both import these:

- ``_rows``: ``EnvRows``, any kind of env (a vector, a multi-agent vector with one row
  per (env, agent), a ``BatchEnv``) as policy rows, in two parts for double buffering,
  and ``make_env_rows``; ``DeviceRows``, a torch ``BatchEnv``'s rows kept on its device;
- ``_policy``: ``RowPolicy``, one forward pass per step over every row, sampling from
  noise keyed by seed, env slot and step (``simkit/_noise.py``), on the host or resident
  on a device;
- ``_static_act``: the policy's act over static buffers (a CUDA graph on CUDA);
- ``_loop``: ``RolloutLoop``, which turns them into ``T``-step fragments, written once
  over an array namespace (numpy on the host; torch on one device: the device loop, whose
  fragments are ``DeviceFragment``).
"""
