"""What the runtime's processes say to each other, one definition for both sides: the heartbeat path's
messages, the greeting that proves an attempt's member, sealed store values, registrations, and the stack-dump request.
"""
