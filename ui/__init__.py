"""Tandem's window: PySide6 widgets over the application core (app/).

Thin by design: widgets show what `app.workspace.workspace.Workspace` reports through
its events and forward what the user does as workspace calls. Only the GUI
thread touches widgets; asyncio runs on Qt's loop (qasync), so nothing here
waits for the engine. `ui.main:run` is the `tandem` command.
"""
