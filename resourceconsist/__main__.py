"""``python -m resourceconsist``: the command line."""

from resourceconsist.commands.cli import main

main()
