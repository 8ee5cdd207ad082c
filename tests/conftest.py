pytest_plugins = ["tests.redis_fixtures"]
