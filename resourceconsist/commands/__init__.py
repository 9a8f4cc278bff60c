"""The commands of the ``resourceconsist`` command line, each a module: ``cli`` (the entry point and
``run``), ``showcase`` (``demo``), ``explain`` and ``handover``. The top floor: nothing in the
package imports them (docs/concepts.md, "Layers")."""
