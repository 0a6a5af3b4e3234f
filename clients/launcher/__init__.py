"""The launcher: rollout servers as Ray actors across a cluster (``launch``,
``RayServers``; the ``simkit[ray]`` extra). Ray places, restarts and tracks; ZeroMQ carries
the data.
"""
