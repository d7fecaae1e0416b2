"""Panes and what they say: Workspace (panes, turns, broadcast), Pane, Conversation (kept token ids),
model slots (one engine per model), replies (turns to engine batches), the context policy, word diff.
"""
