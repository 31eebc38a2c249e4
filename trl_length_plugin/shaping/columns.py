"""The names of the per-prompt columns every host and tool reads and writes: the metadata of
docs/reference/length-penalties.md §2.10, §2.12-2.14 and §2.20, and the agent column of §2.3.

Every reader and writer imports them from here (the hosts' datasets, ``trl-length profile`` and
``preview``, the target-length tools, the core's metadata parser). Needs only pydantic: the command line
and the offline tools import it before torch.
"""

from __future__ import annotations

from .fields import BAND_CHANNELS

PROFILED_REWARDS = "profiled_rewards"
PROFILED_OUTPUT_LENGTHS = "profiled_output_lengths"
PROFILE_BAND = "profile_band"
TARGET = "target_length"
#: the per-prompt metadata columns, read from the top level of each dataset row (§2.14)
METADATA_COLUMNS = (PROFILED_REWARDS, PROFILED_OUTPUT_LENGTHS, PROFILE_BAND, TARGET)

#: the dataset column naming each prompt's agent unless ``agent_column`` names another (§2.3)
AGENT_COLUMN = "agent"
#: columns the hosts read for themselves (TRL's prompt and nested metadata, verl's data source, group id and
#: ``extra_info``): a term's own column may not take their names
HOST_COLUMNS = ("prompt", "completion", AGENT_COLUMN, "extra_env_info", "data_source", "uid", "extra_info")
#: the columns of one rollout in the file ``trl-length profile`` and ``preview`` read (docs/profiles.md), and the
#: prompt's id there: a term's own column may not take their names either
ROLLOUT_COLUMNS = ("group", "completion", "reasoning_tokens", "answer_tokens", "completion_tokens", "reward")
PROMPT_ID = "prompt_id"

#: the parts of a prompt's metadata flagged malformed apart (``PromptMetadata.invalid``): each band channel,
#: the profile, an unknown channel name and the target length
PROFILED = "profiled"
CHANNEL_NAME = "channel_name"
METADATA_KEYS = (*BAND_CHANNELS, PROFILED, CHANNEL_NAME, TARGET)
#: the parts that belong to a prompt's ``profile_band``
BAND_KEYS = (*BAND_CHANNELS, CHANNEL_NAME)
