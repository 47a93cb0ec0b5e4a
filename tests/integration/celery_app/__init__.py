"""A tiny Celery app for tests/integration/test_celery_amqp.py (not a test)."""
