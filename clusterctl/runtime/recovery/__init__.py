"""The batch host's step after each attempt: gather the facts, ask the restart policy (policy.py, pure),
carry the decision out.
"""
