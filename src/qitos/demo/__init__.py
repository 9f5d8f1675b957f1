"""The qitos demo: ``NotesAgent`` indexes a small bundled workspace of Markdown notes.

``qitos demo`` runs it end to end, offline. See :mod:`qitos.demo.notes_agent`.
"""

from qitos.demo.notes_agent import (
    NoteEntry,
    NotesAgent,
    NotesState,
    bundled_note_paths,
    prepare_workspace,
    render_index,
    scripted_model_responses,
)

__all__ = [
    "NoteEntry",
    "NotesAgent",
    "NotesState",
    "bundled_note_paths",
    "prepare_workspace",
    "render_index",
    "scripted_model_responses",
]
