"""The qitos demo: ``NotesAgent`` indexes a small bundled workspace of Markdown notes.

``qitos demo`` runs it end to end, offline.
"""

from qitos.demo._notes_agent import NotesAgent, NotesState

__all__ = ["NotesAgent", "NotesState"]
