"""The CLI verbs besides training: estimate, export, chat, report, ls/--help, and the support matrix
generator; argv: the command line before Hydra composes it (replay, resume=, Hydra's start-up errors)."""
