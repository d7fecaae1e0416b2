"""Documents a user gives a model: a file read as text (plain text, Markdown, code, CSV,
JSON, HTML, PDF, Word), bounded against hostile files, and the one form it takes in a user
turn. No Qt; the app, the window and the OpenAI server all use this package.

Reading blocks (a PDF may take seconds): call it off the GUI thread or event loop. The
`cancel` event is checked between parts, and a PDF or Word file's child process is killed
when it is set.
"""

from engine.documents.document import Document
from engine.documents.prompt import document_block, user_message_with_documents
from engine.documents.reading import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_CHARS, document_from_bytes, read_document
from engine.errors import DocumentCancelled, DocumentError

__all__ = [
    "MAX_DOCUMENT_BYTES", "MAX_DOCUMENT_CHARS", "Document", "DocumentCancelled", "DocumentError",
    "document_block", "document_from_bytes", "read_document", "user_message_with_documents",
]
