"""moto's CloudFormation, taught AWS::SecretsManager::Secret: run by tests/src/moto.rs in the
moto server's process before its main (`Moto::start`)."""
import json

# CloudFormation's AWS::SecretsManager::Secret, which moto's CloudFormation lacks (5.2 warns and
# creates nothing): the secret made in moto's Secrets Manager, its value SecretString or one
# GenerateSecretString makes as AWS does (PasswordLength, 32 by default, of the character classes
# not excluded, one of each unless told); Ref is its ARN. A JSON template of keys
# (GenerateStringKey) is refused rather than made wrong.
from moto.core.common_models import CloudFormationModel
from moto.secretsmanager.models import secretsmanager_backends
from moto.secretsmanager.utils import random_password

class StackSecret(CloudFormationModel):
    # moto files each model under its service, read from the module's name.
    __module__ = "moto.secretsmanager.stack_secret"

    def __init__(self, arn, backend):
        self.arn, self.backend = arn, backend

    @property
    def physical_resource_id(self):
        return self.arn

    @staticmethod
    def cloudformation_name_type():
        return "Name"

    @staticmethod
    def cloudformation_type():
        return "AWS::SecretsManager::Secret"

    @classmethod
    def has_cfn_attr(cls, attr):
        return attr == "Id"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id,
                                        region_name, **kwargs):
        props = cloudformation_json.get("Properties", {})
        gen = props.get("GenerateSecretString")
        value = props.get("SecretString")
        if gen is not None:
            if "GenerateStringKey" in gen or "SecretStringTemplate" in gen:
                raise NotImplementedError("GenerateStringKey: not made by this stand-in")
            flag = lambda k, default=False: str(gen.get(k, default)).lower() == "true"
            value = random_password(int(gen.get("PasswordLength", 32)),
                                    gen.get("ExcludeCharacters", ""), flag("ExcludeNumbers"),
                                    flag("ExcludePunctuation"), flag("ExcludeUppercase"),
                                    flag("ExcludeLowercase"), flag("IncludeSpace"),
                                    flag("RequireEachIncludedType", True))
        backend = secretsmanager_backends[account_id][region_name]
        made = backend.create_secret(name=resource_name, secret_string=value,
                                     secret_binary=None, description=props.get("Description"),
                                     tags=props.get("Tags"), kms_key_id=props.get("KmsKeyId"),
                                     client_request_token=None, replica_regions=[],
                                     force_overwrite=False)
        return cls(json.loads(made)["ARN"], backend)

    def is_created(self):
        return True

    @classmethod
    def update_from_cloudformation_json(cls, original_resource, new_resource_name,
                                        cloudformation_json, account_id, region_name):
        return original_resource

    @classmethod
    def delete_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id,
                                        region_name):
        secretsmanager_backends[account_id][region_name].delete_secret(
            secret_id=resource_name, recovery_window_in_days=None,
            force_delete_without_recovery=True)
