"""Ships the ``as_energon`` startup hook, ``megatron_energon_lite_as_energon.pth``, into
site-packages, by a wheel and by an editable install alike (everything else is in pyproject.toml).

The hook runs in every new interpreter and switches it only where ``ENERGON_LITE_AS_ENERGON`` is
set, which ``import megatron_energon_lite.as_energon`` does for its child processes (see that
module's docstring).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = "megatron_energon_lite_as_energon.pth"


class BuildPyWithStartupHook(build_py):
    """``build_py`` that also puts the hook at the top level of the wheel (= site-packages)."""

    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).resolve().parent / HOOK), self._hook_target(), preserve_mode=False)

    def _hook_target(self) -> str:
        # An editable wheel (PEP 660) is made of install_lib, not of build_lib (which setuptools
        # maps back to the sources); a regular wheel is made of build_lib.
        top = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        return str(Path(top) / HOOK)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), self._hook_target()]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
