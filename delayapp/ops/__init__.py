"""What operators do, as small async functions that return plain data.

The command line (:mod:`delayapp.faustapp.commands`), the web views and the tests call them.
Each takes the :class:`~delayapp.settings.Settings` and the topic layout it works on (never
the Faust app's globals); printing is the caller's business.
"""
