"""`python -m maxtext_netdata.config > configs/base.yml`: the documented defaults, from the model."""

from maxtext_netdata.config import base_yml

print(base_yml(), end="")
