from flask_wtf import FlaskForm
from wtforms import BooleanField, EmailField, PasswordField, StringField
from wtforms.validators import DataRequired, EqualTo, Length


class SignUpForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=254)])
    display_name = StringField("Name", validators=[Length(max=120)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=256)])
    confirm = PasswordField(
        "Repeat password",
        validators=[DataRequired(), EqualTo("password", message="The passwords differ.")],
    )


class SignInForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=254)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=256)])
    remember = BooleanField("Keep me signed in")
