"""Transactions: coordinators, their logs, deadlines and finalize (buffers and pending acks
follow)."""
