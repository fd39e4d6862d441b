"""A user's extension of delayapp, as the README shows: one more agent on the same app.

The agent "fails" every payment and hands it to ``retry_later``; past the retry limit the
helper dead-letters it. Run by ``faust -A tests.support.user_app worker``.
"""

import os

from delayapp import app
from delayapp.client import retry_later

payments = app.topic(
    os.environ["TEST_PAYMENTS_TOPIC"], key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)


@app.agent(payments)
async def charge(stream):
    """Pretend the payment provider is down: retry with a short backoff."""
    async for event in stream.events():
        await retry_later(event, backoff="300ms")
