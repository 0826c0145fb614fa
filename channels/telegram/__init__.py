"""agenthost's built-in Telegram channel adapter (`agenthost channels add BOT telegram`); needs the `telegram`
extra (python-telegram-bot), imported only in the adapter's own process."""

from agenthost.plugins.hookspecs import hookimpl


@hookimpl
def agenthost_register_channels(register):  # type: ignore[no-untyped-def]
    try:
        from agenthost.channels.telegram.adapter import TelegramAdapter
    except ModuleNotFoundError as exc:
        if exc.name != "telegram":
            raise
        raise RuntimeError(
            "the Telegram adapter needs python-telegram-bot: pip install 'agenthost[telegram]'"
        ) from None
    register(TelegramAdapter)
