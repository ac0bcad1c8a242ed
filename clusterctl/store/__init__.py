"""The rendezvous store as every process uses it: sealed values and bounded reads of many keys.

torch's TCPStore is shared by the controller, the ranks and the in-memory
snapshots' restore agreement (checkpoint/), so what a value's seal is and
how many keys one request may ask for are defined once, below them all.
"""
