"""``ctxfarm-agent``: a device that works for the farm (docs/device-lab.md).

``enroll`` makes the device's Ed25519 key pair and registers its public key and what the device is
with a single-use enrollment token (``identity``); ``run`` leases verification jobs, installs each
artifact as ``farm install`` does, measures it through the runner registry (``workers.backends``)
and posts a report signed with the device's key (``jobs``). The HTTP side is ``wire``. A front
door like ``workers.main``: it may import farm.client and the runner registry, never a backend.
"""
