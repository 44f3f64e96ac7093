"""Recorded camera datasets: the labelled on-disk format, MOTChallenge sequences and synthetic scenes."""

from models.datasets.labelled import UNCERTAIN, LabelledDataset, Polygon, open_dataset, write_labelled
from models.datasets.mot import edge_crossings, export_mot, mot_dataset
from models.datasets.synth import write_synthetic

__all__ = [
    "UNCERTAIN",
    "LabelledDataset",
    "Polygon",
    "edge_crossings",
    "export_mot",
    "mot_dataset",
    "open_dataset",
    "write_labelled",
    "write_synthetic",
]
