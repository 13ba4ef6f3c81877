"""The one exception type that means "the user's input is wrong": one sentence, exit code 2."""


class UserError(Exception):
    """Bad input or an unusable environment. The message is one sentence a user can act on."""

    exit_code = 2


TF_EXTRA = "pip install 'tpuprof[tf]'"


def import_tensorflow(needs: str):
    """TensorFlow, for the few paths that run it (TF and Keras preflight, resolving a Cloud TPU name); it is not a
    dependency of tpuprof itself. NEEDS starts the sentence said when it is missing ("Preflight of a Keras model")."""
    try:
        import tensorflow
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise tensorflow_missing(needs) from None
    return tensorflow


def tensorflow_missing(needs: str) -> UserError:
    return UserError(f"{needs} needs TensorFlow, which tpuprof installs only when asked ({TF_EXTRA}).")
