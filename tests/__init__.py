"""The suite: unit/ (mirrors the packages, no server, seconds), integration/ (real PostgreSQL, Redis,
SeaweedFS and QNN compiles), common/ (fakes and builders named by role, shared by both).
May import every package and infra.devfarm (the dev launcher); nothing in the product imports tests."""
