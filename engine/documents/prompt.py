"""The user turn a message with documents becomes. One form, built only here, so the same
documents and question give the same string, and so the same token ids, in every pane on
a model, in every later turn and through the API: a document's pages are computed once and
then come from the prefix cache."""

from __future__ import annotations

from collections.abc import Sequence

from engine.documents.document import Document


def document_block(document: Document) -> str:
    """One document as the prompt holds it: its text between tags naming the file."""
    name = document.name.replace('"', "'")
    part = "" if document.complete else ' part="first part only"'
    return f'<document name="{name}"{part}>\n{document.text}\n</document>'


def user_message_with_documents(question: str, documents: Sequence[Document]) -> str:
    """The user turn's text: each document's block, in order, then the question.
    Without documents, the question unchanged."""
    if not documents:
        return question
    blocks = "\n\n".join(document_block(d) for d in documents)
    return f"{blocks}\n\n{question}" if question else blocks
