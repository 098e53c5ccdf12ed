"""The network service (Arrow Flight): ``pulsartxn serve``; the wire protocol it shares with
the remote client (``pulsartxn.remote``) is ``protocol``."""
