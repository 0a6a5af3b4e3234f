"""Protocol clients: the learner side of the wire.

``RemoteVectorEnv`` (a Gymnasium ``VectorEnv`` over the step protocol, one or several
servers), ``RemoteMultiAgentVectorEnv`` / ``RemoteParallelEnv`` (multi-agent servers),
``PolicyStream`` (fragments from servers that run the policy), the connection with its
CURVE keys and timeouts, and the remote demo. No learning lives here.
"""
