from dashboard import create_app

app = create_app()
