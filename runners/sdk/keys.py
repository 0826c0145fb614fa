"""How a run gets a provider key, in the words an operator acts on. Runners never see the host's environment:
a key reaches a run only from the host's key store, named by the run's binding. One wording for every runner that
reports a missing or refused key."""

from __future__ import annotations


def how_to_give_key(name: str, runner: str = "<runner>") -> str:
    """The steps that put key `name` in front of a run of `runner` (no trailing period)."""
    return (
        f"Store the key with `agenthost keys set {name}` and give it to the binding with `agenthost bots bind "
        f"<bot> --runner {runner} --key {name}` (or set the binding's api_key_env to the name of another "
        "stored key)"
    )
