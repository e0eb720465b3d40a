"""The data wing: every step from a file (or a hub dataset) to the batches a trainer reads, in one package.

The data options of ``conf/data/`` name their components here (``hydratune.components.data.ChatDataset``...),
as saved run dirs do; README.md beside this file draws the path and says which module holds each step.
"""

from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.preferences import PreferenceDataset, UnpairedPreferenceDataset
from hydratune.components.data.prompts import PromptDataset

__all__ = ["ChatDataset", "PreferenceDataset", "PromptDataset", "UnpairedPreferenceDataset"]
