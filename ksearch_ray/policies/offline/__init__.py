"""The offline policy's parts: configs and the search space, the learned model, planning, coding.

`ksearch_ray.policies.offline.offline_policy` puts them together as `OfflinePolicy`; its docstring describes the design.
"""
