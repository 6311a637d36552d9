"""What DDPState and ReduceScatter share in restoring a state_dict()."""


def check_state_options(who, state, obj, kind=None, this="object"):
    """Raises ValueError unless ``state`` is a version 1 state_dict (of ``kind``, where
    given) saved under the options ``obj`` holds (``obj._STATE_OPTIONS``): feedback state
    is only valid under the options that produced it. ``who`` names the class in the
    messages (lowbit_torch.<who>.load_state_dict), ``this`` what they call ``obj``."""
    method = f"lowbit_torch.{who}.load_state_dict"
    if state.get("version") != 1 or (kind is not None and state.get("kind") != kind):
        raise ValueError(f"{method}: not a {who} state_dict (version {state.get('version')!r})")
    for k in obj._STATE_OPTIONS:
        if state[k] != getattr(obj, k):
            raise ValueError(f"{method}: the checkpoint has {k}={state[k]!r}, "
                             f"this {this} {k}={getattr(obj, k)!r}")
