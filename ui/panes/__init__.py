"""One pane: its header and settings popover, message and Markdown views, the composer and the
compare bar.
"""
