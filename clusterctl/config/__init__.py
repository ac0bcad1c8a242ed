"""Configuration: the job spec and the site config as written, validated into models (pydantic), and their problems."""
