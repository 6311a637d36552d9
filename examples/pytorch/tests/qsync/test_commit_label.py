"""scripts/commit-label: the commit a measurement's CSV names. A device machine may hold a
copy of the working tree beside an older .git; then the label must say the code is not
that commit's (no torch needed)."""

import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", "scripts", "commit-label"))


def git(repo, *args):
    return subprocess.run(["git", "-C", repo] + list(args), capture_output=True, text=True,
                          check=True).stdout.strip()


@unittest.skipIf(shutil.which("git") is None, "needs git")
class CommitLabel(unittest.TestCase):
    def label(self, repo, **env):
        e = {k: v for k, v in os.environ.items() if k != "COMMIT"}
        e.update(env)
        return subprocess.run([os.path.join(repo, "scripts", "commit-label")],
                              capture_output=True, text=True, env=e, check=True).stdout.strip()

    def test_clean_modified_given_and_no_git(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, "scripts"))
            shutil.copy(SCRIPT, os.path.join(repo, "scripts", "commit-label"))
            self.assertEqual(self.label(repo), "unknown")  # no repository
            git(repo, "init", "-q")
            with open(os.path.join(repo, "code.txt"), "w") as f:
                f.write("one\n")
            git(repo, "add", ".")
            git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
            head = git(repo, "rev-parse", "--short", "HEAD")
            self.assertEqual(self.label(repo), head)
            with open(os.path.join(repo, "untracked.txt"), "w") as f:
                f.write("not code of the commit's\n")
            self.assertEqual(self.label(repo), head)  # untracked files do not count
            with open(os.path.join(repo, "code.txt"), "w") as f:
                f.write("two\n")
            self.assertEqual(self.label(repo), head + "+modified")
            self.assertEqual(self.label(repo, COMMIT="abc1234"), "abc1234")


if __name__ == "__main__":
    unittest.main()
