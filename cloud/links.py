"""The REST paths of an event's parts, in one place: the API's answers and the notifications link to them."""

from __future__ import annotations


def event_path(event_id: int) -> str:
    return f"/api/events/{event_id}"


def clip_path(event_id: int) -> str:
    return f"{event_path(event_id)}/clip.mp4"


def frame_path(frame_id: int) -> str:
    return f"/api/frames/{frame_id}.jpg"
