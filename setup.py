"""Maps the repository's top-level folders to one installed import root, ``circuitstat``.

The design card fixes the folders (circuits/, stats/, pipelines/, reports/ at the top of the repository); users
import them as ``circuitstat.circuits`` and so on, and no bare ``circuits``/``stats``/``pipelines``/``reports``
is installed (they would collide with other distributions and with a user's own ``stats.py``). Everything
else is declared in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

# the import root's own folder, then each layer's folder and its subpackages under circuitstat.<layer>
LAYERS = {"core": "core", "circuits": "circuits", "stats": "stats", "pipelines": "pipelines", "reports": "reports"}
# Every folder is listed, data folders too (the service's templates, static files and Alembic migrations, loaded
# by path): setuptools warns about each folder of package data that is not a listed package.
EXCLUDE = ["__pycache__", "*.__pycache__"]

package_dir = {"circuitstat": "circuitstat"}
packages = ["circuitstat"]
for name, folder in LAYERS.items():
    package_dir[f"circuitstat.{name}"] = folder
    packages.append(f"circuitstat.{name}")
    packages += [f"circuitstat.{name}.{sub}" for sub in find_namespace_packages(folder, exclude=EXCLUDE)]

setup(package_dir=package_dir, packages=packages)
