"""The CLI verbs besides training: estimate, export, chat, report, ls/--help, and the support matrix
generator."""
