"""``python -m resourceconsist``: the command line."""

from resourceconsist.cli import main

main()
