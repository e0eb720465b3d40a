"""The config layer: the schema every run composes, the registry that turns component dataclasses into
Hydra schemas, the options conf/ holds (one source of truth for the derived tables), resolvers, the
trust rules for _target_s and checkpoints, and the errors that name a key."""
