"""agenthost's built-in Telegram channel adapter (`agenthost channels add BOT telegram`); needs the `telegram`
extra (python-telegram-bot)."""

from agenthost.plugins.hookspecs import hookimpl


@hookimpl
def agenthost_register_channels(register):  # type: ignore[no-untyped-def]
    from agenthost.channels.telegram.adapter import TelegramAdapter

    register(TelegramAdapter)
