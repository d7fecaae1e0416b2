"""The main window as wiring: the action table behind the menus, the banner, the status bar and the
parts of the window's own work (model loading, chats, serving).
"""
