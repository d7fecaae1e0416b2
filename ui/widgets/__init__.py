"""Widgets used in more than one place: the sampling form, the chats sidebar.
"""
