"""Saved chats: ChatStore over SQLite (connection, schema, one migration function per version,
records), the writer thread, the recorder that follows a Workspace, the session (crash detection,
restore), export/import and the `tandem chats` command.
"""
